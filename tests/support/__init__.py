"""What the tests share that is not a fixture: paths, helpers. No test module imports
another test module; they import from here (or from the helper modules beside conftest.py)."""
