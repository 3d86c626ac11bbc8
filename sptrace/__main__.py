import sys

from sptrace.cli import main

sys.exit(main())
