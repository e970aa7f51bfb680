# /// script
# dependencies = ["rich>=13"]
# ///
print(1)
