"""entmtp.runtime"""
