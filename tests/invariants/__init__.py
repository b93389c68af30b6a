"""Each invariant fails on a planted bug, and only that invariant does."""
