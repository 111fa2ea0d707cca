"""Infrastructure below everything: errors, config loading, tracking, processes, devices and cores."""
