"""One module per Metacontroller controller (and the budget webhook): decoded request -> rules ->
exact response."""

# When the related objects Metacontroller sent were selected by rules other than today's (the
# class changed between customize and sync), the answer keeps what exists and asks for a resync
# this soon, by which time Metacontroller has asked customize again.
STALE_RULES_RETRY_SECONDS = 10.0
