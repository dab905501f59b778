"""Speaking: the reply's text cut into fragments and synthesized by piper as it is generated."""
