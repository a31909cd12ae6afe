"""``python -m unthrottle_lab``: the ``unthrottle-lab`` command."""

from unthrottle_lab.cli import main

main()
