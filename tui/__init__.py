"""The Textual operator console (`infermux top`)."""
