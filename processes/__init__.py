"""Process plumbing shared by the runtime and calibration: which launcher started this process, the host's cores,
malloc tuning, naming a failed rank, quieting native stderr. Nothing here chooses a plan or prices one.
"""
