"""A failing trace turned into a small bug report: cutting a trace down (``slice``),
shrinking it while it fails the same way (``shrink``), checking that replays agree bit for
bit (``determinism``), writing the bundle (``bundle``), and the whole workflow
(``reproduction``)."""
