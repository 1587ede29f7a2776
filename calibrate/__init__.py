"""entmtp.calibrate"""
