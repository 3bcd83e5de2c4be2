"""Modal screens: slots, record."""
