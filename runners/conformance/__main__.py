from runners.conformance.cli import main

main()
