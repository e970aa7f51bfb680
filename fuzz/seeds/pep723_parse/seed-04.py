# /// script
# dependencies = "x"
# ///
