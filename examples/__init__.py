"""An example serving engine and its RecoverSSM module (not installed with the package)."""
