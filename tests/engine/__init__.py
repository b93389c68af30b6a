"""Self-tests of the engine tier."""
