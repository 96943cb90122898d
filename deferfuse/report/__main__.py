"""`python -m deferfuse.report [options] script.py [args...]`: the same as `deferfuse-report`."""
import sys

from deferfuse.report.cli import main

sys.exit(main())
