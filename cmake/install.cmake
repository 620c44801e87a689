# `cmake --install`: the public headers, both libraries and a CMake package config, so that a
# project outside this tree builds with find_package(tpfuse) (examples/gemm does).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS tpfuse tpfuse_static EXPORT tpfuseTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/tpfuse DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT tpfuseTargets NAMESPACE tpfuse:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tpfuse)

configure_package_config_file(cmake/tpfuseConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/tpfuseConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tpfuse)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tpfuseConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tpfuseConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/tpfuseConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tpfuse)
