"""`python -m ltc_async.patches.native [-v]`: build the native hooks for this torch (see __init__)."""
import sys

from . import build

print(f"ltc_async native hooks built: {build(verbose='-v' in sys.argv)}")
