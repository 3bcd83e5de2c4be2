"""Inspector and chat widgets."""
