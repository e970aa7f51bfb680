# /// script
# dependencies = ["numpy>=", "requests[", "; rm -rf /", 1]
# ///
