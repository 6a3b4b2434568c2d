"""`python -m mncloud` runs the CLI."""

from mncloud.cli import main

main()
