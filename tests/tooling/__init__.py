"""``python -m fuzz`` and its campaigns, and the repository's docs and set-up files."""
