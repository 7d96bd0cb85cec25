"""``python -m localstate``: the same command line as ``localstate``."""

from localstate.cli import main

if __name__ == "__main__":
    main()
