//! KVM ABI structs as bytes, for snapshot files.

use kvm_bindings::{
    kvm_clock_data, kvm_cpuid_entry2, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state,
    kvm_pit_state2, kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};

/// A `repr(C)` struct of the kernel's KVM ABI made only of integers (and unions and arrays of
/// them): every byte is initialized and every byte pattern is a value, which KVM validates when
/// it is handed back. Only the structs listed below implement it.
pub(crate) trait KvmAbi: Default {}

impl KvmAbi for kvm_regs {}
impl KvmAbi for kvm_sregs {}
impl KvmAbi for kvm_xsave {}
impl KvmAbi for kvm_xcrs {}
impl KvmAbi for kvm_debugregs {}
impl KvmAbi for kvm_lapic_state {}
impl KvmAbi for kvm_mp_state {}
impl KvmAbi for kvm_vcpu_events {}
impl KvmAbi for kvm_cpuid_entry2 {}
impl KvmAbi for kvm_irqchip {}
impl KvmAbi for kvm_pit_state2 {}
impl KvmAbi for kvm_clock_data {}

/// The bytes of `value`.
#[allow(unsafe_code)]
pub(crate) fn bytes_of<T: KvmAbi>(value: &T) -> &[u8] {
    // SAFETY: KvmAbi types are fully initialized plain integers (see the trait), so reading
    // size_of::<T>() bytes from a live reference is valid for the reference's lifetime.
    unsafe {
        std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>())
    }
}

/// A value from exactly `size_of::<T>()` bytes.
#[allow(unsafe_code)]
pub(crate) fn from_bytes<T: KvmAbi>(bytes: &[u8]) -> Option<T> {
    if bytes.len() != std::mem::size_of::<T>() {
        return None;
    }
    let mut value = T::default();
    // SAFETY: the length matches size_of::<T>() and any byte pattern is a KvmAbi value (see
    // the trait); source and destination are distinct.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            (&mut value as *mut T).cast::<u8>(),
            bytes.len(),
        )
    };
    Some(value)
}
