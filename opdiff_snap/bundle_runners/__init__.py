"""Standalone scripts `opdiff bundle` copies into a bundle. They import nothing of this
package (a device has only its runtime and NumPy), and the tool never imports them."""
