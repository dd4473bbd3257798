"""`python -m lathe` runs the command line."""

from lathe.cli import main

raise SystemExit(main())
