"""What becomes of a failure: outcome classes, deduplication, triage, repros."""
