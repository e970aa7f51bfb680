def f():
    return """
    # /// script
    # dependencies = ["evil"]
    # ///
    """
