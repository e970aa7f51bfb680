# /// script
# dependencies = ["a"]
# ///
x = 1
# /// script
# dependencies = ["b"]
# ///
