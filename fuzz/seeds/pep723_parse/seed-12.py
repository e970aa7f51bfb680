# /// script
# dependencies = ["pkg @ https://example.invalid/pkg-1.0.tar.gz", "torch==2.4.0+cpu; sys_platform == 'linux'", "Foo_Bar[x,y]~=1.2"]
# requires-python = ">=3.10, <4"
# ///
