import sys

from posenc.cli import main

sys.exit(main())
