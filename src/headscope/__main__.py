"""`python -m headscope` runs the CLI."""
from headscope.cli import main

raise SystemExit(main())
