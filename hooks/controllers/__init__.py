"""One module per Metacontroller controller: decoded request -> rules -> exact response."""
