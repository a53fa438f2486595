# Locates the ONNX Runtime C/C++ API headers (onnxruntime_c_api.h, onnxruntime_cxx_api.h) and sets
# ONNX_NORM_ORT_INCLUDE_DIR. Only headers are needed: the library never links against libonnxruntime,
# it receives the API table from RegisterCustomOps at load time.
#
# Order:
#   1. ONNX_NORM_ORT_INCLUDE_DIR (CMake variable or environment variable): used as given, must be valid.
#   2. A system install (/usr/include/onnxruntime, or anywhere on CMAKE_PREFIX_PATH).
#   3. On Debian-like systems: Debian's libonnxruntime-dev from suite ONNX_NORM_ORT_DEB_SUITE (trixie,
#      ORT 1.21 headers), downloaded with apt-get through a temporary sources list that reuses the mirror
#      of this machine's own apt configuration, unpacked into the build tree and cached there.

set(_ort_hint "Set ONNX_NORM_ORT_INCLUDE_DIR (environment variable or -DONNX_NORM_ORT_INCLUDE_DIR=...) to a \
directory containing onnxruntime_c_api.h and onnxruntime_cxx_api.h (ONNX Runtime >= 1.17; tested with 1.21; for example \
<onnxruntime release>/include, or install Debian's libonnxruntime-dev).")

option(ONNX_NORM_ORT_FETCH_DEB "Fetch the ONNX Runtime headers from Debian's libonnxruntime-dev if none are found" ON)
set(ONNX_NORM_ORT_DEB_SUITE "trixie" CACHE STRING "Debian suite whose libonnxruntime-dev provides the headers")
set(ONNX_NORM_APT_ETC "/etc/apt" CACHE PATH "apt configuration directory whose sources give the Debian mirror")

function(_onnx_norm_check_ort_dir dir out)
  if(EXISTS "${dir}/onnxruntime_c_api.h" AND EXISTS "${dir}/onnxruntime_cxx_api.h")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

# Debian codenames only: the temporary sources list points the same mirror at another Debian suite,
# which is meaningless for Ubuntu or derivative archives.
set(_debian_codenames buster bullseye bookworm trixie forky sid)

# Reads the first usable Debian mirror URI from the machine's apt configuration (deb822 first, then
# the one-line format). Security, updates and backports archives do not carry the package.
function(_onnx_norm_find_debian_mirror out)
  set(_uri "")
  file(GLOB _deb822 "${ONNX_NORM_APT_ETC}/sources.list.d/*.sources")
  foreach(_file IN LISTS _deb822)
    file(READ "${_file}" _text)
    string(REPLACE "\n\n" ";" _stanzas "${_text}")
    foreach(_stanza IN LISTS _stanzas)
      if(NOT _stanza MATCHES "(^|\n)[Tt]ypes:[^\n]*deb([ \t]|\n|$)")
        continue()
      endif()
      if(NOT _stanza MATCHES "(^|\n)URIs:[ \t]*([^ \t\n]+)")
        continue()
      endif()
      set(_candidate "${CMAKE_MATCH_2}")
      if(NOT _stanza MATCHES "(^|\n)Suites:[ \t]*([^\n]+)")
        continue()
      endif()
      set(_suites "${CMAKE_MATCH_2}")
      if(_candidate MATCHES "security" OR _stanza MATCHES "(^|\n)[ \t]*[Ee]nabled:[ \t]*no")
        continue()
      endif()
      string(REGEX REPLACE "[ \t]+" ";" _suites "${_suites}")
      foreach(_suite IN LISTS _suites)
        if(_suite IN_LIST _debian_codenames)
          set(_uri "${_candidate}")
          break()
        endif()
      endforeach()
      if(_uri)
        break()
      endif()
    endforeach()
    if(_uri)
      break()
    endif()
  endforeach()
  if(NOT _uri AND EXISTS "${ONNX_NORM_APT_ETC}/sources.list")
    file(STRINGS "${ONNX_NORM_APT_ETC}/sources.list" _lines REGEX "^[ \t]*deb[ \t]")
    foreach(_line IN LISTS _lines)
      # deb [options] URI suite components
      string(REGEX REPLACE "\\[[^]]*\\]" "" _line "${_line}")
      if(_line MATCHES "^[ \t]*deb[ \t]+([^ \t]+)[ \t]+([^ \t]+)")
        set(_candidate "${CMAKE_MATCH_1}")
        set(_suite "${CMAKE_MATCH_2}")
        if(_candidate MATCHES "security" OR _suite MATCHES "-(security|updates|backports)$")
          continue()
        endif()
        if(_suite IN_LIST _debian_codenames)
          set(_uri "${_candidate}")
          break()
        endif()
      endif()
    endforeach()
  endif()
  set(${out} "${_uri}" PARENT_SCOPE)
endfunction()

function(_onnx_norm_fetch_deb_headers out)
  set(_root "${CMAKE_BINARY_DIR}/ort-headers")
  set(_inc "${_root}/x/usr/include/onnxruntime")
  _onnx_norm_check_ort_dir("${_inc}" _cached)
  if(_cached)
    message(STATUS "onnx-norm: using cached ONNX Runtime headers from ${_inc}")
    set(${out} "${_inc}" PARENT_SCOPE)
    return()
  endif()

  find_program(APT_GET apt-get)
  if(NOT APT_GET OR NOT EXISTS "${APT_GET}")
    message(FATAL_ERROR "onnx-norm: ONNX Runtime headers not found and apt-get is not available to fetch them. "
                        "${_hint}")
  endif()
  _onnx_norm_find_debian_mirror(_mirror)
  if(NOT _mirror)
    message(FATAL_ERROR "onnx-norm: ONNX Runtime headers not found, and no Debian mirror was found in "
                        "${ONNX_NORM_APT_ETC} to fetch libonnxruntime-dev from. ${_hint}")
  endif()
  set(_keyring "/usr/share/keyrings/debian-archive-keyring.gpg")
  if(NOT EXISTS "${_keyring}")
    message(FATAL_ERROR "onnx-norm: ${_keyring} is missing, so Debian's libonnxruntime-dev cannot be verified. "
                        "${_hint}")
  endif()

  message(STATUS "onnx-norm: fetching libonnxruntime-dev (Debian ${ONNX_NORM_ORT_DEB_SUITE}) through this "
                 "machine's apt mirror")
  file(REMOVE_RECURSE "${_root}")
  file(MAKE_DIRECTORY "${_root}/lists/partial" "${_root}/cache/archives/partial" "${_root}/deb")
  file(WRITE "${_root}/sources.list" "deb [signed-by=${_keyring}] ${_mirror} ${ONNX_NORM_ORT_DEB_SUITE} main\n")
  # Lists and caches live in the build tree, so neither root nor the system's apt lock is needed.
  set(_apt_opts
      -q
      -oDir::Etc::SourceList=${_root}/sources.list
      -oDir::Etc::SourceParts=/dev/null
      -oDir::State::Lists=${_root}/lists
      -oDir::Cache=${_root}/cache
      -oDir::Cache::pkgcache=
      -oDir::Cache::srcpkgcache=
      -oAcquire::Languages=none
      -oAPT::Sandbox::User=root
      -oAcquire::Retries=1
      -oAcquire::http::Timeout=30
      -oDebug::NoLocking=1)
  execute_process(
    COMMAND "${APT_GET}" ${_apt_opts} update
    RESULT_VARIABLE _rc
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _err)
  # apt-get update exits 0 even when every download failed; it only prints warnings.
  if(NOT _rc EQUAL 0 OR _err MATCHES "(^|\n)(W|E): (Failed to fetch|Some index files failed)" OR _err MATCHES
                                                                                                  "NO_PUBKEY")
    message(FATAL_ERROR "onnx-norm: apt-get update for Debian ${ONNX_NORM_ORT_DEB_SUITE} failed (exit ${_rc}):\n"
                        "${_err}\n${_hint}")
  endif()
  execute_process(
    COMMAND "${APT_GET}" ${_apt_opts} download libonnxruntime-dev
    WORKING_DIRECTORY "${_root}/deb"
    RESULT_VARIABLE _rc
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _err)
  file(GLOB _debs "${_root}/deb/libonnxruntime-dev_*.deb")
  if(NOT _rc EQUAL 0 OR NOT _debs)
    message(FATAL_ERROR "onnx-norm: apt-get download libonnxruntime-dev failed (exit ${_rc}):\n${_err}\n${_hint}")
  endif()
  list(GET _debs 0 _deb)

  find_program(DPKG_DEB dpkg-deb)
  file(MAKE_DIRECTORY "${_root}/x")
  if(DPKG_DEB)
    execute_process(COMMAND "${DPKG_DEB}" -x "${_deb}" "${_root}/x" RESULT_VARIABLE _rc ERROR_VARIABLE _err)
  else()
    # CMake's libarchive reads the .deb (an ar archive), then its data.tar.* member.
    file(MAKE_DIRECTORY "${_root}/ar")
    execute_process(COMMAND "${CMAKE_COMMAND}" -E tar xf "${_deb}" WORKING_DIRECTORY "${_root}/ar"
                    RESULT_VARIABLE _rc ERROR_VARIABLE _err)
    file(GLOB _data "${_root}/ar/data.tar*")
    if(_rc EQUAL 0 AND _data)
      execute_process(COMMAND "${CMAKE_COMMAND}" -E tar xf "${_data}" WORKING_DIRECTORY "${_root}/x"
                      RESULT_VARIABLE _rc ERROR_VARIABLE _err)
    endif()
  endif()
  _onnx_norm_check_ort_dir("${_inc}" _ok)
  if(NOT _rc EQUAL 0 OR NOT _ok)
    message(FATAL_ERROR "onnx-norm: unpacking ${_deb} did not give the ONNX Runtime headers: ${_err}\n${_hint}")
  endif()
  # Drop the ~10 MB of package lists; the unpacked headers are the cache.
  file(REMOVE_RECURSE "${_root}/lists" "${_root}/cache")
  set(${out} "${_inc}" PARENT_SCOPE)
endfunction()

set(_hint "${_ort_hint}")
set(ONNX_NORM_ORT_INCLUDE_DIR "" CACHE PATH "Directory with the ONNX Runtime C/C++ API headers (also read from the environment)")
if(NOT ONNX_NORM_ORT_INCLUDE_DIR AND DEFINED ENV{ONNX_NORM_ORT_INCLUDE_DIR})
  set(ONNX_NORM_ORT_INCLUDE_DIR "$ENV{ONNX_NORM_ORT_INCLUDE_DIR}")
endif()

if(ONNX_NORM_ORT_INCLUDE_DIR)
  _onnx_norm_check_ort_dir("${ONNX_NORM_ORT_INCLUDE_DIR}" _ok)
  if(NOT _ok)
    message(FATAL_ERROR "onnx-norm: ONNX_NORM_ORT_INCLUDE_DIR=${ONNX_NORM_ORT_INCLUDE_DIR} does not contain "
                        "onnxruntime_c_api.h and onnxruntime_cxx_api.h. ${_hint}")
  endif()
  set(_ort_inc "${ONNX_NORM_ORT_INCLUDE_DIR}")
else()
  find_path(_ORT_SYSTEM_INCLUDE onnxruntime_cxx_api.h PATH_SUFFIXES onnxruntime onnxruntime/core/session)
  if(_ORT_SYSTEM_INCLUDE)
    set(_ort_inc "${_ORT_SYSTEM_INCLUDE}")
  elseif(ONNX_NORM_ORT_FETCH_DEB AND (EXISTS "/etc/debian_version" OR EXISTS "${ONNX_NORM_APT_ETC}/sources.list.d"))
    _onnx_norm_fetch_deb_headers(_ort_inc)
  else()
    message(FATAL_ERROR "onnx-norm: ONNX Runtime headers not found. ${_hint}")
  endif()
endif()

file(STRINGS "${_ort_inc}/onnxruntime_c_api.h" _ver_line REGEX "^#define ORT_API_VERSION [0-9]+")
string(REGEX MATCH "[0-9]+" ONNX_NORM_ORT_API_VERSION "${_ver_line}")
if(ONNX_NORM_ORT_API_VERSION LESS 17)
  message(FATAL_ERROR "onnx-norm: the ONNX Runtime headers in ${_ort_inc} have ORT_API_VERSION "
                      "${ONNX_NORM_ORT_API_VERSION}; version 17 (ONNX Runtime 1.17) or newer is needed. ${_hint}")
endif()
message(STATUS "onnx-norm: ONNX Runtime headers: ${_ort_inc} (ORT_API_VERSION ${ONNX_NORM_ORT_API_VERSION})")
set(ONNX_NORM_ORT_INCLUDE_DIR_RESOLVED "${_ort_inc}")
