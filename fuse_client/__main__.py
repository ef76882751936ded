import sys

from fuse_client.cli import main

sys.exit(main())
