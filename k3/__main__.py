from k3.cli import main

main(prog_name="k3")
