from runners.cli import main

main()
