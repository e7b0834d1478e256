"""What the tests share: problems and checks, engines and modules that get recorded, trace helpers, seeds."""
