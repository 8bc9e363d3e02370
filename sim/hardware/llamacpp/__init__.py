"""The llama.cpp backend: a real llama-server (server.py), the route that builds it from a pinned source release
(build.py), and recording through it (record.py, commands.py). Everything here runs the server as a separate
process over HTTP on loopback; nothing imports llama.cpp."""
