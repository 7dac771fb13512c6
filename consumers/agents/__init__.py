"""The agents Voice runs on its one engine: concern extraction (and, later, the others)."""
