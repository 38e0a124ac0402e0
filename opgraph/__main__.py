"""`python -m opgraph ...`: the same command as `opgraph ...`."""

from .tools.cli import main

if __name__ == "__main__":
    main(prog_name="opgraph")
