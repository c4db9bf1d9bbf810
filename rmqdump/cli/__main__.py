"""``python -m rmqdump.cli`` = the ``rmqdump`` command."""

from . import main

if __name__ == "__main__":
    main()
