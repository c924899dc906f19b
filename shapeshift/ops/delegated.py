"""(being written)"""
def delegated_rule(domain, op_type, opset):
    return None
