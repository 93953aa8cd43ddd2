"""One router per concern: health, tasks (register, status, close), reports (uploads), queries."""
