"""Many runs: a scenario suite (``baft suite``) and generated fault campaigns (``baft fuzz``)."""
