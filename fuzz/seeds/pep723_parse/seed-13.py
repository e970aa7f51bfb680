# /// script
# note = """
# ///
# /// script
# ///
# """
# x = 1.5e3
# y = nan
# z = 1979-05-27T07:32:00Z
# ///
