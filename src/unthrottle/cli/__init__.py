"""The ``unthrottle`` command line: thin wiring over the library."""
