"""Start processes: phalanx builds launcher argument lists and hands over to the launcher."""
