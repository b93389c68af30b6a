"""``python -m fuzz.bench``: see :mod:`fuzz.bench`."""

from fuzz.bench import main

raise SystemExit(main())
