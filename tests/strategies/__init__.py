"""What the strategies and the spec-kind table draw, and what the targets reach."""
