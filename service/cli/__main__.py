"""`python -m service.cli` runs the command line."""

from service.cli import main

main()
