from k3.cli import main

main()
