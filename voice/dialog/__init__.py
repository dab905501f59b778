"""The dialog: a session, its turns (a reply to one request), home actions and tool calls."""
