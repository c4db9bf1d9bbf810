"""``python -m rmqdump.cli`` = the ``rmqdump`` command."""

from rmqdump.cli import main

if __name__ == "__main__":
    main()
