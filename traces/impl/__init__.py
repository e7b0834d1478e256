"""What runs a trace's events: loading an implementation from an ``--impl`` spec
(``loader``: a module exposing the kernel API, or a file) and the adapter for a module
that offers only the documented surface (``surface``), with the route each op takes."""
