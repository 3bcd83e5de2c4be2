"""The Textual app: draws engine snapshots only."""
