import sys

from dressage.cli import main

sys.exit(main())
