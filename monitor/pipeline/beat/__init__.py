"""The beat's side of the pipeline (monitor.pipeline): which slots, races and scenarios are due,
claimed once, and the message each is sent as."""
